-- Cluster registry (issue 14, docs/cluster.md "Node registry"): one row per node of each cluster.
-- Times are the database's (now()), never a node's clock.
CREATE TABLE cluster_nodes (
  cluster       TEXT NOT NULL,
  node          TEXT NOT NULL,
  host          TEXT NOT NULL,
  version       TEXT NOT NULL,
  roots_digest  TEXT NOT NULL,
  secret_digest TEXT NOT NULL,
  listen        TEXT NOT NULL,
  state         TEXT NOT NULL CHECK (state IN ('joining','active','draining','left')),
  incarnation   BIGINT NOT NULL,
  heartbeat_ms  BIGINT NOT NULL,
  probe_name    TEXT,
  probe_hash    TEXT,
  probe_verdict TEXT,
  started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
  heartbeat_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (cluster, node)
);
