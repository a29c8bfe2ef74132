-- postonce outbox, schema version 1 (PostgreSQL).
-- {schema} is replaced by the quoted schema name. Times are Unix seconds
-- (double precision), as in the SQLite outbox, so both decode alike.

CREATE TABLE {schema}.intents (
    id                 bigserial PRIMARY KEY,
    reference          text NOT NULL,
    key                text NOT NULL,
    provider           text NOT NULL,
    method             text NOT NULL,
    url                text NOT NULL,
    headers            text NOT NULL,          -- JSON list of [name, value]; never a secret
    body               bytea NOT NULL,
    fingerprint        text NOT NULL,
    state              text NOT NULL,
    created_at         double precision NOT NULL,
    updated_at         double precision NOT NULL,
    first_delivery_at  double precision,       -- retry-horizon anchor; NULL while never sent
    due_at             double precision,
    deadline_at        double precision,
    attempts           integer NOT NULL DEFAULT 0,
    last_outcome       text,
    lease_owner        text,
    lease_expires_at   double precision,
    claim_token        text,
    response_status    integer,
    response_headers   text,
    response_body      bytea,
    response_truncated integer,
    response_sha256    text,
    note               text,
    purged_at          double precision        -- set when purge keeps only a tombstone
);

CREATE UNIQUE INDEX intents_reference ON {schema}.intents (reference);
CREATE UNIQUE INDEX intents_key ON {schema}.intents (key);
-- Partial indexes: only the rows a claim looks for, so finished rows cost nothing.
CREATE INDEX intents_due ON {schema}.intents (due_at, id) WHERE state = 'pending';
CREATE INDEX intents_touched ON {schema}.intents (updated_at) WHERE state = 'pending';
CREATE INDEX intents_lease ON {schema}.intents (lease_expires_at, id) WHERE state = 'sending';

CREATE TABLE {schema}.attempts (
    id          bigserial PRIMARY KEY,
    intent_id   bigint NOT NULL REFERENCES {schema}.intents (id),
    number      integer NOT NULL,
    started_at  double precision NOT NULL,
    duration    double precision NOT NULL,
    outcome     text NOT NULL,
    status      integer,
    error_type  text,
    replayed    integer,
    owner       text
);

CREATE INDEX attempts_intent ON {schema}.attempts (intent_id, number);
