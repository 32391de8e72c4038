-- Count the end of one child of a fan-in (django_rcoord.queues.fan_in), and queue the
-- fan-in's callback, with every child's result, once all of them have ended. A child's end
-- is counted once however often this runs for it: the task that runs it is queued with the
-- child's end (in the step that records it) and runs at least once.
-- KEYS[1]  fan-in prefix of the callback's group (`rcoord:queue:{<group>}:fan-in:`)
-- KEYS[2]  the callback's group's messages HASH
-- KEYS[3]  the callback's queue's ready ZSET
-- KEYS[4]  the callback's group's queues HASH
-- KEYS[5]  the callback's group's wake LIST
-- KEYS[6]  the callback's group's idle ZSET
-- Builds   KEYS[1] .. <fan-in id>: the fan-in's HASH: state (waiting, fired, failed or
--          cancelled), total, ended, failed, message (the callback's, its results' place
--          held by the JSON text in hole), queue, priority, wake_ms, keep_ms, ttl_ms (how
--          long it is kept once it is over), ids (its children's, JSON), and c:<n> for each
--          child n that ended: its place in the callback's results (JSON)
-- ARGV[1]  fan-in id (its callback's task id)
-- ARGV[2]  the child's place, 1 to total
-- ARGV[3]  the child's place in the results (JSON: its return value, a failure, or null)
-- ARGV[4]  how it ended: 'ok', 'fail' (it failed, and fails the fan-in), or 'failed' (it
--          failed, and the fan-in goes on: policy continue or ignore)
-- Returns  'fired' (the callback is queued), 'failed' (this child failed the fan-in: the
--          caller cancels the children left), 'counted', 'seen' (counted already) or
--          'gone' (no such fan-in: it expired)
--! include _ready

local fan_in = KEYS[1] .. ARGV[1]
local state = redis.call('HGET', fan_in, 'state')
if not state then
    return 'gone'
end
if redis.call('HSETNX', fan_in, 'c:' .. ARGV[2], ARGV[3]) == 0 then
    return 'seen'
end
local ended = redis.call('HINCRBY', fan_in, 'ended', 1)
if ARGV[4] ~= 'ok' then
    redis.call('HINCRBY', fan_in, 'failed', 1)
end
if state ~= 'waiting' then
    return 'counted'
end
local fields = redis.call('HMGET', fan_in, 'total', 'message', 'hole', 'queue', 'priority',
    'wake_ms', 'keep_ms', 'ttl_ms')
local total, ttl_ms = tonumber(fields[1]), tonumber(fields[8])
if ARGV[4] == 'fail' then
    redis.call('HSET', fan_in, 'state', 'failed')
    redis.call('PEXPIRE', fan_in, ttl_ms)
    return 'failed'
end
if ended < total then
    return 'counted'
end
-- Every child ended: the results in their order, 1,000 fields a call (unpack's stack).
local results = {}
for first = 1, total, 1000 do
    local places = {}
    for n = first, math.min(first + 999, total) do
        places[#places + 1] = 'c:' .. n
    end
    for _, value in ipairs(redis.call('HMGET', fan_in, unpack(places))) do
        results[#results + 1] = value
    end
end
local message, hole = fields[2], fields[3]
local at = string.find(message, hole, 1, true)
message = string.sub(message, 1, at - 1) .. '[' .. table.concat(results, ',') .. ']'
    .. string.sub(message, at + #hole)
enqueue_now(KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], fields[4], tonumber(fields[7]),
    ARGV[1], message, tonumber(fields[5]), fields[6])
redis.call('HSET', fan_in, 'state', 'fired')
redis.call('PEXPIRE', fan_in, ttl_ms)
return 'fired'
