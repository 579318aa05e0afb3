-- Comb schema, version 8: who pushed each message.
--
-- When bearer tokens are required, the subject (`sub`) of the token a message was pushed with
-- is stored with it and handed to consumers as `producerSub`. Nullable and without a default,
-- so adding it rewrites nothing, and messages pushed without a token keep it NULL.
ALTER TABLE comb.messages ADD COLUMN producer_sub text;
