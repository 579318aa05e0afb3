-- Comb schema, version 13: who pushed each dead-lettered message.
--
-- A dead letter is a copy of its message, kept after the message's segment is dropped, so
-- the producer's token subject (`producer_sub`, version 9) is copied with it and shown as
-- `producerSub` in the dead-letter listings; a requeued message keeps it. Nullable and without
-- a default: adding it rewrites nothing, and older dead letters read NULL.
ALTER TABLE comb.dead_letters ADD COLUMN producer_sub text;
