-- Store an item of a delay queue and note when it was pushed (server time).
-- KEYS[1]  items ZSET (id -> push time, ms)   KEYS[2] data HASH (id -> JSON)
-- KEYS[3]  sequence STRING (counter: ids sort in push order among equal push times)
-- ARGV[1]  JSON data
-- Returns  the item's id.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local id = string.format('%016d', redis.call('INCR', KEYS[3]))
redis.call('HSET', KEYS[2], id, ARGV[1])
redis.call('ZADD', KEYS[1], now, id)
return id
