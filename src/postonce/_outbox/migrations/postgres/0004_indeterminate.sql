-- postonce outbox, schema version 4 (PostgreSQL): indeterminate endings are reconciled.
-- 'indeterminate' is a new state (an answer that leaves the effect unknown, such as a
-- 5xx the provider stored and replays); drains ask their reconciler about it as about
-- 'expired', through one index. Rows written before keep their state.

DROP INDEX {schema}.intents_expired;
CREATE INDEX intents_unresolved ON {schema}.intents (sender, reconcile_at)
  WHERE state IN ('expired', 'indeterminate');
