-- Watermarks follow the checkpoints (issue 11: one statement fewer per apply
-- transaction). A checkpoint set to N by an apply raises its stream's
-- watermark to N (never lowering it): the run's last seq, which is what the
-- apply used to write itself. An apply that moves no checkpoint (every
-- projection had the run already, or none is registered) still raises the
-- watermark with its own statement.
CREATE TRIGGER outbox_checkpoint_inserted_raises_watermark
AFTER INSERT ON outbox_checkpoints WHEN NEW.last_applied > 0
BEGIN
    INSERT INTO outbox_watermarks (stream, applied_through, updated_at)
    VALUES (NEW.stream, NEW.last_applied, NEW.updated_at)
    ON CONFLICT (stream) DO UPDATE SET applied_through = excluded.applied_through,
        updated_at = excluded.updated_at
    WHERE excluded.applied_through > outbox_watermarks.applied_through;
END;

CREATE TRIGGER outbox_checkpoint_raised_raises_watermark
AFTER UPDATE OF last_applied ON outbox_checkpoints WHEN NEW.last_applied > OLD.last_applied
BEGIN
    INSERT INTO outbox_watermarks (stream, applied_through, updated_at)
    VALUES (NEW.stream, NEW.last_applied, NEW.updated_at)
    ON CONFLICT (stream) DO UPDATE SET applied_through = excluded.applied_through,
        updated_at = excluded.updated_at
    WHERE excluded.applied_through > outbox_watermarks.applied_through;
END;
