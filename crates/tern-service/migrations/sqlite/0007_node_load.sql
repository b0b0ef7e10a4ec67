-- Node load: PostgreSQL only (cluster_nodes lives there; docs/cluster.md). This step keeps the
-- two stores' schema versions in step.
SELECT 1;
