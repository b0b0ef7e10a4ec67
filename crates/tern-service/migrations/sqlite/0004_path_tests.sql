-- Scheduled path tests (issue 15): schedules and their results, newest 2,000 kept per schedule
-- by the service. Times are unix seconds, rates Gb/s. See docs/service.md.
CREATE TABLE path_tests (
  id            INTEGER PRIMARY KEY AUTOINCREMENT,
  spec          TEXT NOT NULL,
  owner         TEXT,
  created_at    INTEGER NOT NULL,
  next_at       INTEGER NOT NULL,
  regressed     INTEGER NOT NULL DEFAULT 0,
  alert_pending INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX path_tests_due ON path_tests (next_at, id);

CREATE TABLE path_test_results (
  id            INTEGER PRIMARY KEY AUTOINCREMENT,
  schedule_id   INTEGER NOT NULL REFERENCES path_tests (id) ON DELETE CASCADE,
  at            INTEGER NOT NULL,
  ok            INTEGER NOT NULL,
  rtt_ms        REAL,
  one_gbps      REAL,
  many_gbps     REAL,
  streams       INTEGER,
  verdict       TEXT,
  expected_gbps REAL,
  error         TEXT,
  baseline_gbps REAL,
  regressed     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX path_test_results_by_schedule ON path_test_results (schedule_id, id);
