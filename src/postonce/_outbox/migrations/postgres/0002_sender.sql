-- postonce outbox, schema version 2 (PostgreSQL): sender identity.
-- sender: who may send an intent; origin: scheme://host:port it is addressed to.
-- Rows from version 1 have neither; the first client whose origins include a
-- row's origin adopts it. Claims read one sender's due rows, so the claim
-- indexes lead with the sender.

ALTER TABLE {schema}.intents ADD COLUMN sender text;
ALTER TABLE {schema}.intents ADD COLUMN origin text;
DROP INDEX {schema}.intents_due;
DROP INDEX {schema}.intents_lease;
CREATE INDEX intents_due ON {schema}.intents (sender, due_at, id) WHERE state = 'pending';
CREATE INDEX intents_lease ON {schema}.intents (sender, lease_expires_at, id) WHERE state = 'sending';
CREATE INDEX intents_unowned ON {schema}.intents (id) WHERE sender IS NULL;
