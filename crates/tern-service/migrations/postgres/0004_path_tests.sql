-- Scheduled path tests (issue 15): the same schema as migrations/sqlite/0004_path_tests.sql in
-- PostgreSQL's types. Times are unix seconds, rates Gb/s. See docs/service.md.
CREATE TABLE path_tests (
  id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  spec          TEXT NOT NULL,
  owner         TEXT,
  created_at    BIGINT NOT NULL,
  next_at       BIGINT NOT NULL,
  regressed     BIGINT NOT NULL DEFAULT 0,
  alert_pending BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX path_tests_due ON path_tests (next_at, id);

CREATE TABLE path_test_results (
  id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  schedule_id   BIGINT NOT NULL REFERENCES path_tests (id) ON DELETE CASCADE,
  at            BIGINT NOT NULL,
  ok            BIGINT NOT NULL,
  rtt_ms        DOUBLE PRECISION,
  one_gbps      DOUBLE PRECISION,
  many_gbps     DOUBLE PRECISION,
  streams       BIGINT,
  verdict       TEXT,
  expected_gbps DOUBLE PRECISION,
  error         TEXT,
  baseline_gbps DOUBLE PRECISION,
  regressed     BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX path_test_results_by_schedule ON path_test_results (schedule_id, id);
