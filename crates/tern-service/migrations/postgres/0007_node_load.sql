-- Node load (docs/cluster.md "Nodes on the dashboard, the API and /metrics"): what each node's
-- heartbeat last reported — the jobs its runner has, the bytes/s they move, the host's 1-minute
-- load average (NULL where /proc/loadavg cannot be read).
ALTER TABLE cluster_nodes ADD COLUMN running_jobs BIGINT NOT NULL DEFAULT 0;
ALTER TABLE cluster_nodes ADD COLUMN rate_bps DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE cluster_nodes ADD COLUMN load1 DOUBLE PRECISION;
