-- postonce outbox, schema version 5 (PostgreSQL): an intent says which of a call's own
-- secrets its sends need. needs: a JSON list of their names (headers in lower case,
-- query parameters as ?name), never a value; NULL when the client's own credentials
-- suffice, as for every row written before. An older release neither writes nor reads it.

ALTER TABLE {schema}.intents ADD COLUMN needs text;
