-- A catalog as spillbox made it before migrations were named: the first two migrations of
-- commit dc4d044's catalog.py, recorded by number alone in schema_migrations, with one task,
-- one artifact and its log entry. Dumped with sqlite3's iterdump.
BEGIN TRANSACTION;
CREATE TABLE access_log (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            task_id TEXT NOT NULL,
            artifact_id TEXT,
            action TEXT NOT NULL,
            at REAL NOT NULL,
            actor TEXT NOT NULL,
            detail TEXT NOT NULL DEFAULT ''
        );
INSERT INTO "access_log" VALUES(1,'t1','a1','offload',1.5,'t','a1');
CREATE TABLE artifacts (
            task_id TEXT NOT NULL REFERENCES tasks(task_id),
            artifact_id TEXT NOT NULL,
            call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            name TEXT NOT NULL,
            path TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            tokens INTEGER,
            tokens_exact INTEGER,
            sha256 TEXT NOT NULL,
            created_at REAL NOT NULL,
            last_access_at REAL NOT NULL,
            expires_at REAL,
            state TEXT NOT NULL DEFAULT 'live' CHECK (state IN ('live', 'deleted')),
            pinned INTEGER NOT NULL DEFAULT 0,
            redactions INTEGER NOT NULL DEFAULT 0,
            deleted_at REAL,
            deleted_by TEXT,
            PRIMARY KEY (task_id, artifact_id)
        );
INSERT INTO "artifacts" VALUES('t1','a1','a1','t','a1.json','/sandbox/offload/a1.json',10,3,1,'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',1.5,1.5,NULL,'live',0,0,NULL,NULL);
CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at);
INSERT INTO "schema_migrations" VALUES(1,0);
INSERT INTO "schema_migrations" VALUES(2,0);
CREATE TABLE tasks (
            task_id TEXT PRIMARY KEY,
            created_at REAL NOT NULL,
            closed_at REAL,
            delete_after REAL,
            retention TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed', 'deleted')),
            deleted_at REAL,
            deleted_by TEXT
        );
INSERT INTO "tasks" VALUES('t1',0.0,NULL,NULL,'{}','open',NULL,NULL);
CREATE INDEX artifacts_by_expiry ON artifacts(state, expires_at);
CREATE INDEX artifacts_by_call ON artifacts(task_id, call_id);
CREATE INDEX access_log_by_task ON access_log(task_id, id);
CREATE INDEX artifacts_by_digest ON artifacts(task_id, sha256);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('access_log',1);
COMMIT;
