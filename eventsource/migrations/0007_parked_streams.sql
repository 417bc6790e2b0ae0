-- Parked streams (docs/design/parking.md): a subscription that parks a
-- stream when it dead-letters one of its events holds the stream's later
-- events back, in order, until an operator releases it. A parked stream
-- costs this row, never a copy of its events: they stay in events, and the
-- bucket's checkpoint moves over them; a release reads them again by stream
-- (the primary key), from done_version + 1. {{schema}} is replaced by the
-- quoted schema name.
--
-- The row has no slot: the bucket a stream belongs to is derived from
-- cg_hash in whichever generation reads it, so a resize moves nothing
-- (the dead letter records the generation and bucket that parked it).
--
-- event_id, position and version are the dead letter that parked it (at
-- most one per subscription and stream), reason that letter's reason when
-- it parked it. done_version: the stream's events up to it are done for
-- the subscription (the letter's own version while parked; the release
-- moves it). action is what an operator asked for: NULL while parked;
-- 'replay' or 'discard', a release the reader carries out; 'skip', the
-- stream passed over for good (the row stays, the reader delivers nothing
-- of it again).
CREATE TABLE {{schema}}.parked_streams (
    subscription text        NOT NULL,
    stream_name  text        NOT NULL,
    cg_hash      bigint      NOT NULL,
    event_id     uuid        NOT NULL,
    position     bigint      NOT NULL,
    version      bigint      NOT NULL,
    done_version bigint      NOT NULL,
    reason       text        NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    action       text        CHECK (action IN ('replay', 'discard', 'skip')),
    requested_at timestamptz,
    PRIMARY KEY (subscription, stream_name),
    CHECK ((action IS NULL) = (requested_at IS NULL)),
    CHECK (done_version >= version - 1)
);
