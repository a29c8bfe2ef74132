-- An outbox at schema version 1, as postonce wrote it before the outbox layer was shared
-- (written by the store at commit 6840201; see tests/test_outbox.py).
BEGIN TRANSACTION;
CREATE TABLE attempts ( intent_id INTEGER NOT NULL REFERENCES intents (id), number INTEGER NOT NULL, started_at FLOAT NOT NULL, duration FLOAT NOT NULL, outcome TEXT NOT NULL, status INTEGER, error_type TEXT, replayed INTEGER, owner TEXT, PRIMARY KEY (intent_id, number)) WITHOUT ROWID;
INSERT INTO "attempts" VALUES(1,1,1700000000.0,0.2,'final',201,NULL,0,'old');
INSERT INTO "attempts" VALUES(2,1,1700000000.0,0.2,'ambiguous',NULL,'ReadTimeout',0,'old');
CREATE TABLE "intents" (
   "id" INTEGER PRIMARY KEY,
   "reference" TEXT NOT NULL,
   "key" TEXT NOT NULL,
   "provider" TEXT NOT NULL,
   "method" TEXT NOT NULL,
   "url" TEXT NOT NULL,
   "headers" TEXT NOT NULL,
   "body" BLOB NOT NULL,
   "fingerprint" TEXT NOT NULL,
   "state" TEXT NOT NULL,
   "created_at" REAL NOT NULL,
   "updated_at" REAL NOT NULL,
   "first_delivery_at" REAL,
   "due_at" REAL,
   "deadline_at" REAL,
   "attempts" INTEGER NOT NULL DEFAULT 0,
   "last_outcome" TEXT,
   "lease_owner" TEXT,
   "lease_expires_at" REAL,
   "claim_token" TEXT,
   "response_status" INTEGER,
   "response_headers" TEXT,
   "response_body" BLOB,
   "response_truncated" INTEGER,
   "response_sha256" TEXT,
   "note" TEXT,
   "purged_at" REAL
);
INSERT INTO "intents" VALUES(1,'done','key-done','stripe','POST','https://api.example/v1/charges','[["content-type", "application/json"]]',X'7B22616D6F756E74223A3130307D','ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff','succeeded',1700000000.0,1700000000.2,1700000000.0,NULL,NULL,1,'final',NULL,NULL,NULL,201,'[["content-type", "application/json"]]',X'7B226964223A2263685F31227D',0,'s',NULL,NULL);
INSERT INTO "intents" VALUES(2,'retry','key-retry','stripe','POST','https://api.example/v1/charges','[["content-type", "application/json"]]',X'7B22616D6F756E74223A3130307D','ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff','pending',1700000000.0,1700000000.2,1700000000.0,1700000005.0,NULL,1,'ambiguous',NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "intents" VALUES(3,'crashed','key-crashed','stripe','POST','https://api.example/v1/charges','[["content-type", "application/json"]]',X'7B22616D6F756E74223A3130307D','ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff','sending',1700000000.0,1700000000.0,1700000000.0,NULL,NULL,0,NULL,'old',1700000060.0,'5dd510aabf13c6a9b655adff',NULL,NULL,NULL,NULL,NULL,NULL,NULL);
CREATE UNIQUE INDEX "intents_reference"
    ON "intents" ("reference");
CREATE UNIQUE INDEX "intents_key"
    ON "intents" ("key");
CREATE INDEX intents_due ON intents (due_at) WHERE state = 'pending';
CREATE INDEX intents_touched ON intents (updated_at) WHERE state = 'pending';
CREATE INDEX intents_lease ON intents (lease_expires_at) WHERE state = 'sending';
COMMIT;
PRAGMA user_version = 1;
