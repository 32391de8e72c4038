-- Complete a purchase decided under a lock, if that lock's fencing token is still current,
-- and queue the seller's sold-item e-mail in the same step (when its keys are given).
-- KEYS[1]  fences HASH (lock name -> highest fencing token that wrote)
-- KEYS[2]  market ZSET ("<item>.<seller>" -> price)
-- KEYS[3]  buyer HASH (funds)
-- KEYS[4]  seller HASH (funds)
-- KEYS[5]  buyer inventory SET
-- KEYS[6..12]  optional: the e-mail task's queue keys (django_rcoord.queues.producer.enqueue_in_script)
-- Builds   KEYS[7] .. ' key:<fair key>', KEYS[7] .. ' heads', KEYS[7] .. ' waiting',
--          KEYS[7] .. ' running': the fair keys' lines of the e-mail task's queue (KEYS[7]
--          its ready ZSET, see _ready)
-- ARGV[1]  lock name   ARGV[2] fencing token   ARGV[3] market member   ARGV[4] item id
-- ARGV[5]  price the buyer saw
-- ARGV[6..13]  with KEYS[6..12]: the e-mail task's arguments (enqueue_in_script)
-- Returns  {outcome, queued}: outcome 1 bought; 0 the item is gone or its price changed;
--          -1 the buyer lacks funds; -2 a newer lock holder has written already (this
--          holder's lock had expired). queued: what enqueue_task returned (1, or 2 when the
--          queue group's keys were new), 0 when no e-mail was queued.
--! include django_rcoord:_enqueue
local token = tonumber(ARGV[2])
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if token <= last then
    return {-2, 0}
end
redis.call('HSET', KEYS[1], ARGV[1], token)
local price = redis.call('ZSCORE', KEYS[2], ARGV[3])
if not price or tonumber(price) ~= tonumber(ARGV[5]) then
    return {0, 0}
end
price = tonumber(price)
if tonumber(redis.call('HGET', KEYS[3], 'funds') or '0') < price then
    return {-1, 0}
end
-- Redis does not undo a script's writes when a later command fails, so the e-mail is queued
-- before the purchase is written: a queue that refuses the task leaves no purchase behind.
local queued = 0
if #KEYS == 12 then
    queued = enqueue_task(KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12],
        ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13])
end
redis.call('HINCRBY', KEYS[4], 'funds', price)
redis.call('HINCRBY', KEYS[3], 'funds', -price)
redis.call('SADD', KEYS[5], ARGV[4])
redis.call('ZREM', KEYS[2], ARGV[3])
return {1, queued}
