-- Jobs and tokens. Times are unix seconds. See docs/service.md.
CREATE TABLE jobs (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  state       TEXT NOT NULL CHECK (state IN ('queued','running','retrying','succeeded','failed','canceled')),
  spec        TEXT NOT NULL,
  label       TEXT,
  owner       TEXT,
  created_at  INTEGER NOT NULL,
  updated_at  INTEGER NOT NULL,
  started_at  INTEGER,
  finished_at INTEGER,
  not_before  INTEGER NOT NULL DEFAULT 0,
  attempts    INTEGER NOT NULL DEFAULT 0,
  retries     INTEGER NOT NULL DEFAULT 0,
  progress    TEXT,
  summary     TEXT,
  error       TEXT,
  notified    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX jobs_runnable ON jobs (state, not_before, id);

CREATE TABLE tokens (
  id           TEXT PRIMARY KEY,
  name         TEXT NOT NULL,
  scope        TEXT NOT NULL CHECK (scope IN ('read','transfer','admin')),
  hash         BLOB NOT NULL UNIQUE,
  path_prefix  TEXT,
  created_by   TEXT,
  created_at   INTEGER NOT NULL,
  expires_at   INTEGER,
  revoked_at   INTEGER,
  last_used_at INTEGER
);
