-- Resize identity (docs/resize.md, "every message names its resize"): each
-- resize request takes the next id of its subscription, so that what a
-- worker or a follower learns of a resize — a bound, a proposal's answer,
-- a drain, an outcome — names the resize it belongs to. A stale answer is
-- then recognised by what it is, not by when it arrives: an answer for a
-- resize that was cancelled, and another requested since, is not taken for
-- the new one's.

-- The id of the subscription's resize in force, or of its last one when
-- steady; 0 for a subscription never resized. Ids only grow.
ALTER TABLE {{schema}}.subscriptions ADD COLUMN resize_id bigint NOT NULL DEFAULT 0;

-- The resize that made a generation (NULL for generation 0). A cancel
-- deletes the next generation's row, so a resize completed iff the row of
-- the generation it made still names it.
ALTER TABLE {{schema}}.generations ADD COLUMN resize_id bigint;

-- Existing subscriptions: every completed resize made a generation, so the
-- serving generation g was made by resize g (ids from here on are above
-- it), and one running from g is resize g + 1.
UPDATE {{schema}}.subscriptions SET resize_id = generation + CASE WHEN state = 'steady' THEN 0 ELSE 1 END;
UPDATE {{schema}}.generations g SET resize_id = g.generation
WHERE g.generation > 0 AND g.generation <= (SELECT s.generation FROM {{schema}}.subscriptions s
                                            WHERE s.subscription = g.subscription);
UPDATE {{schema}}.generations g SET resize_id = s.resize_id
FROM {{schema}}.subscriptions s
WHERE s.subscription = g.subscription AND s.state <> 'steady' AND g.generation = s.generation + 1;
