-- The projection store's clock offset: 0 in every production schema, as
-- an IMMUTABLE SQL function the planner inlines and folds to a constant
-- (see the journal's 0010). Only a store opened with the test clock
-- (feature `test-util`) replaces it by one that reads the offset tests
-- store in outbox_projection_meta.
CREATE FUNCTION outbox_projection_clock_offset_ms() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 0::bigint';
