-- Cluster registry: PostgreSQL only (a cluster's nodes share one server; docs/cluster.md). This
-- step keeps the two stores' schema versions in step.
SELECT 1;
