-- Complete a purchase decided under a lock, if that lock's fencing token is still current.
-- KEYS[1]  fences HASH (lock name -> highest fencing token that wrote)
-- KEYS[2]  market ZSET ("<item>.<seller>" -> price)
-- KEYS[3]  buyer HASH (funds)
-- KEYS[4]  seller HASH (funds)
-- KEYS[5]  buyer inventory SET
-- ARGV[1]  lock name   ARGV[2] fencing token   ARGV[3] market member   ARGV[4] item id
-- ARGV[5]  price the buyer saw
-- Returns  1 bought; 0 the item is gone or its price changed; -1 the buyer lacks funds;
--          -2 a newer lock holder has written already (this holder's lock had expired).
local token = tonumber(ARGV[2])
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if token <= last then
    return -2
end
redis.call('HSET', KEYS[1], ARGV[1], token)
local price = redis.call('ZSCORE', KEYS[2], ARGV[3])
if not price or tonumber(price) ~= tonumber(ARGV[5]) then
    return 0
end
price = tonumber(price)
if tonumber(redis.call('HGET', KEYS[3], 'funds') or '0') < price then
    return -1
end
redis.call('HINCRBY', KEYS[4], 'funds', price)
redis.call('HINCRBY', KEYS[3], 'funds', -price)
redis.call('SADD', KEYS[5], ARGV[4])
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
