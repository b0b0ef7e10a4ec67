-- Jobs and tokens: the same schema as migrations/sqlite/0001_init.sql in PostgreSQL's types.
-- Times are unix seconds. See docs/service.md.
CREATE TABLE jobs (
  id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  state       TEXT NOT NULL CHECK (state IN ('queued','running','retrying','succeeded','failed','canceled')),
  spec        TEXT NOT NULL,
  label       TEXT,
  owner       TEXT,
  created_at  BIGINT NOT NULL,
  updated_at  BIGINT NOT NULL,
  started_at  BIGINT,
  finished_at BIGINT,
  not_before  BIGINT NOT NULL DEFAULT 0,
  attempts    BIGINT NOT NULL DEFAULT 0,
  retries     BIGINT NOT NULL DEFAULT 0,
  progress    TEXT,
  summary     TEXT,
  error       TEXT,
  notified    BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX jobs_runnable ON jobs (state, not_before, id);

CREATE TABLE tokens (
  id           TEXT PRIMARY KEY,
  name         TEXT NOT NULL,
  scope        TEXT NOT NULL CHECK (scope IN ('read','transfer','admin')),
  hash         BYTEA NOT NULL UNIQUE,
  path_prefix  TEXT,
  created_by   TEXT,
  created_at   BIGINT NOT NULL,
  expires_at   BIGINT,
  revoked_at   BIGINT,
  last_used_at BIGINT
);
