-- postonce outbox, schema version 3 (PostgreSQL): outcomes reach the application.
-- meta: the caller's JSON data; settle_due_at: a settlement handler owes a call
-- (from then); settled_at: it returned; reconcile_at: when a drain may next ask
-- the reconciler about an expired intent.

ALTER TABLE {schema}.intents ADD COLUMN meta text;
ALTER TABLE {schema}.intents ADD COLUMN settle_due_at double precision;
ALTER TABLE {schema}.intents ADD COLUMN settle_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE {schema}.intents ADD COLUMN settle_error text;
ALTER TABLE {schema}.intents ADD COLUMN settled_at double precision;
ALTER TABLE {schema}.intents ADD COLUMN reconcile_at double precision;
CREATE INDEX intents_settle ON {schema}.intents (sender, settle_due_at) WHERE settle_due_at IS NOT NULL;
CREATE INDEX intents_expired ON {schema}.intents (sender, reconcile_at) WHERE state = 'expired';
