-- Jobs on a cluster (docs/cluster.md "Jobs on a cluster"): the node whose runner has the job's
-- attempt, so that a node restarting re-queues only its own interrupted attempts, and a node
-- that died or left has its attempts re-queued by the others.
ALTER TABLE jobs ADD COLUMN run_node TEXT;
