-- postonce outbox, schema version 6 (PostgreSQL): receipts of the notifications an
-- application received (postonce.receive_once), written in the application's own
-- transaction with the effect they caused. (source, event_id) is the sender's own
-- operation identifier; delivery_id is kept for the audit log only. Purged only on
-- request (postonce outbox purge-receipts). An older release neither writes nor reads it.

CREATE TABLE {schema}.receipts (
    source       text NOT NULL,
    event_id     text NOT NULL,
    delivery_id  text,
    received_at  double precision NOT NULL,
    PRIMARY KEY (source, event_id)
);
CREATE INDEX receipts_received ON {schema}.receipts (received_at);
