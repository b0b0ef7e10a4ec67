-- Run-as mapping (issue 10): the local account a root service runs this token's transfers as.
ALTER TABLE tokens ADD COLUMN run_as TEXT;
