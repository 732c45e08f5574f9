-- The append is one statement (ADR 0042): it locks the streams' version
-- rows by bumping them and checks the expected versions against what it
-- locked. A batch whose versions do not match ends that statement through
-- this function's error, with nothing written; the adapter then calls
-- outbox_append (0008, ADR 0031), which reports the streams' versions.
CREATE FUNCTION outbox_append_refused() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'OB001',
        MESSAGE = 'append refused: a stream''s version is not the one expected';
END
$fn$;
