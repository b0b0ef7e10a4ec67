-- Fair share between owners (tokens): the order in which jobs were claimed, so the scheduler
-- can start the owner with the fewest running jobs, then the one served longest ago.
ALTER TABLE jobs ADD COLUMN claim_seq BIGINT NOT NULL DEFAULT 0;
CREATE INDEX jobs_owner_claim ON jobs (owner, claim_seq);
CREATE INDEX jobs_state_owner ON jobs (state, owner);
