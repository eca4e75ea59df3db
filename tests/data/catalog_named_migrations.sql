-- A catalog made by spillbox at commit dc4d044, the last before Alembic: three tasks
-- (one kept and closed, one open under redaction, one removed), live, pinned and deleted
-- artifacts, and the access log, with its migrations recorded by name in schema_migrations.
-- Dumped with sqlite3's iterdump; tests/test_catalog.py upgrades it in place.
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
INSERT INTO "access_log" VALUES(1,'kept','c1','offload',1.79606327703200602534e+09,'list_prs','c1');
INSERT INTO "access_log" VALUES(2,'kept','c2','offload',1.79606327704144263265e+09,'logs','c2');
INSERT INTO "access_log" VALUES(3,'kept','c3','offload',1.79606327704329109184e+09,'blob','c3');
INSERT INTO "access_log" VALUES(4,'kept','c1','read',1796063277.04412,'read_artifact','');
INSERT INTO "access_log" VALUES(5,'kept','c2','pin',1.79606327704428625109e+09,'harness','');
INSERT INTO "access_log" VALUES(6,'kept','c3','delete',1.79606327704875779155e+09,'retention','manual');
INSERT INTO "access_log" VALUES(7,'open-one','s1','offload',1.79606327722204327582e+09,'env','s1');
INSERT INTO "access_log" VALUES(8,'open-one','s1','redact',1.79606327722206163405e+09,'retention','{"replaced": 1, "kinds": {"token": 1}}');
INSERT INTO "access_log" VALUES(9,'gone','g1','offload',1.79606327722694396973e+09,'t','g1');
INSERT INTO "access_log" VALUES(10,'gone','g1','delete',1.79606327722769832612e+09,'retention','manual');
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
            deleted_by TEXT, kind TEXT,
            PRIMARY KEY (task_id, artifact_id)
        );
INSERT INTO "artifacts" VALUES('kept','c1','c1','list_prs','c1.json','/tmp/oldhome/tasks/kept/offload/c1.json',1150,482,1,'3045639cf979f4b6b90ac56669efc2f6882cbefb8f93f9d7268ba0a47c467067',1.79606327703187918657e+09,1.79606327704400348665e+09,NULL,'live',0,0,NULL,NULL,'json_array');
INSERT INTO "artifacts" VALUES('kept','c2','c2','logs','c2.txt','/tmp/oldhome/tasks/kept/offload/c2.txt',3489,1499,1,'85b51390206c297a03cef0ff95b28e616464e913f9d97abbabcbca8eb52a19e2',1796063277.04133,1796063277.04133,NULL,'live',1,0,NULL,NULL,'text');
INSERT INTO "artifacts" VALUES('kept','c3','c3','blob','c3.bin','/tmp/oldhome/tasks/kept/offload/c3.bin',308,NULL,NULL,'218fa02630351c4137899632b953a4d9ecb43d96cc04405dd872e9699d10ec40',1.79606327704321765896e+09,1.79606327704321765896e+09,NULL,'deleted',0,0,1.79606327704864478112e+09,'manual','binary');
INSERT INTO "artifacts" VALUES('open-one','s1','s1','env','s1.txt','/tmp/oldhome/tasks/open-one/offload/s1.txt',1230,1011,1,'cfacf17ce06c008be7bbc983e4f3fd61f0ea74cc6682b24a6ea53a2acf0816c7',1.79606327722191596034e+09,1.79606327722191596034e+09,1.7966680772219159603e+09,'live',0,1,NULL,NULL,'text');
INSERT INTO "artifacts" VALUES('gone','g1','g1','t','g1.json','/tmp/oldhome/tasks/gone/offload/g1.json',1150,482,1,'3045639cf979f4b6b90ac56669efc2f6882cbefb8f93f9d7268ba0a47c467067',1.79606327722685217857e+09,1.79606327722685217857e+09,1.79666807722685217861e+09,'deleted',0,0,1.79606327722767233848e+09,'manual','json_array');
CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL, name TEXT);
INSERT INTO "schema_migrations" VALUES(1,1.79606327701780343051e+09,'create_tasks_artifacts_and_access_log');
INSERT INTO "schema_migrations" VALUES(2,1.79606327701788401601e+09,'index_artifacts_by_digest');
INSERT INTO "schema_migrations" VALUES(3,1.79606327701809430127e+09,'record_artifact_kind');
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
INSERT INTO "tasks" VALUES('kept',1.79606327703001928328e+09,1.79606327704929161076e+09,NULL,'{"export": "allow", "keep_after_close": null, "max_artifacts": null, "max_bytes": null, "on_quota": "evict", "redact": false, "ttl": null, "ttl_from": "created"}','closed',NULL,NULL);
INSERT INTO "tasks" VALUES('open-one',1.79606327705030608182e+09,NULL,NULL,'{"export": "deny", "keep_after_close": null, "max_artifacts": null, "max_bytes": null, "on_quota": "evict", "redact": true, "ttl": 604800.0, "ttl_from": "created"}','open',NULL,NULL);
INSERT INTO "tasks" VALUES('gone',1.79606327722358632094e+09,NULL,NULL,'{"export": "deny", "keep_after_close": null, "max_artifacts": null, "max_bytes": null, "on_quota": "evict", "redact": false, "ttl": 604800.0, "ttl_from": "created"}','deleted',1.79606327724267911911e+09,'manual');
CREATE INDEX artifacts_by_expiry ON artifacts(state, expires_at);
CREATE INDEX artifacts_by_call ON artifacts(task_id, call_id);
CREATE INDEX access_log_by_task ON access_log(task_id, id);
CREATE INDEX artifacts_by_digest ON artifacts(task_id, sha256);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('access_log',10);
COMMIT;
