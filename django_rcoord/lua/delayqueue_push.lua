-- Store an item of a delay queue and note when it was pushed (server time).
-- KEYS[1]  items ZSET (id -> push time, ms)   KEYS[2] data HASH (id -> JSON)
-- ARGV[1]  id   ARGV[2] JSON data
-- Returns  the push time, ms.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
return now
