-- The failover record (docs/eventsource.md, "Failover"): every change of
-- the server a process of this schema found — another timeline (a
-- promotion), another cluster, or a head below a position it had seen —
-- with the heads before and after. When head_after is below head_before,
-- the positions between were handed out again on the new server, to other
-- events: handlers may have seen events of the old server that no longer
-- exist. Several processes find one failover; they make one row, with the
-- highest head any of them had seen. `kumi status` and the console show
-- it. note_server_change runs as the schema's owner, so workers need no
-- grant on the table.
CREATE TABLE {{schema}}.server_changes (
    id           bigserial   PRIMARY KEY,
    found_at     timestamptz NOT NULL DEFAULT now(),
    reason       text        NOT NULL,
    old_system   text        NOT NULL,
    old_timeline integer     NOT NULL,
    new_system   text        NOT NULL,
    new_timeline integer     NOT NULL,
    head_before  bigint      NOT NULL,
    head_after   bigint,                        -- NULL: no process read it
    found_by     text        NOT NULL DEFAULT '', -- the first finder's application_name, else its role
    reports      integer     NOT NULL DEFAULT 1,  -- processes that found it
    UNIQUE (old_system, old_timeline, new_system, new_timeline, reason)
);

-- The schema is named in the function's search_path, never in its body
-- (a schema name may contain anything, dollar quotes included).
CREATE FUNCTION {{schema}}.note_server_change(p_reason text, p_old_system text, p_old_timeline integer,
                                              p_new_system text, p_new_timeline integer,
                                              p_head_before bigint, p_head_after bigint)
    RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = {{schema}}, pg_temp AS $fn$
BEGIN
    INSERT INTO server_changes AS c (reason, old_system, old_timeline, new_system, new_timeline, head_before,
                                     head_after, found_by)
    VALUES (p_reason, p_old_system, p_old_timeline, p_new_system, p_new_timeline, p_head_before, p_head_after,
            coalesce(nullif(current_setting('application_name', true), ''), session_user::text))
    ON CONFLICT (old_system, old_timeline, new_system, new_timeline, reason) DO UPDATE
    SET head_before = GREATEST(c.head_before, excluded.head_before),
        head_after = coalesce(LEAST(c.head_after, excluded.head_after), c.head_after, excluded.head_after),
        reports = c.reports + 1;
END $fn$;
