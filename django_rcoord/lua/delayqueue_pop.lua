-- Claim up to N items pushed at least `previous` ms ago, oldest first, and delete them.
-- KEYS[1]  items ZSET (id -> push time, ms)   KEYS[2] data HASH (id -> JSON)
-- ARGV[1]  most items to claim   ARGV[2] minimum age, ms
-- Returns  the claimed items' JSON data, oldest first. Claiming and deleting are one step,
--          so two consumers never get the same item and none is left half-claimed.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]),
    'LIMIT', 0, tonumber(ARGV[1]))
if #ids == 0 then
    return {}
end
local data = redis.call('HMGET', KEYS[2], unpack(ids))
redis.call('ZREM', KEYS[1], unpack(ids))
redis.call('HDEL', KEYS[2], unpack(ids))
local found = {}
for i = 1, #ids do
    if data[i] then
        found[#found + 1] = data[i]
    end
end
return found
