-- Dead letters name the generation whose bucket dead-lettered the event
-- (docs/resize.md): a subscription's bucket count can change online, and a
-- bucket number means another set of streams in another generation.
-- bucket stays the bucket within that generation. Generations run from 0
-- to 32767 (a checkpoint's slot, generation * 65536 + bucket, fits int4).
ALTER TABLE {{schema}}.dead_letters ADD COLUMN generation integer NOT NULL DEFAULT 0
    CHECK (generation BETWEEN 0 AND 32767);
-- dead_letters_bucket stays: older workers' list queries use it.
CREATE INDEX dead_letters_generation ON {{schema}}.dead_letters (subscription, generation, bucket, position);
