-- A dead letter keeps what came before its reason: each earlier reason,
-- oldest first, with its attempts and when it was replaced (by a failed
-- replay's error, or by the event's dead-lettering again), so the first
-- reason an event was given up for is never lost. Bounded: the first entry and the latest
-- 19. {{schema}} is replaced by the quoted schema name.
ALTER TABLE {{schema}}.dead_letters ADD COLUMN history jsonb NOT NULL DEFAULT '[]'::jsonb;
