-- Extend the leases of tasks this worker still holds (their records, unfinished, have no
-- expiry: see _records); in the same step, say which of them cancel() asked to stop
-- (task_cancel sets their stop keys), so that the worker learns of it without a call of
-- its own.
-- KEYS[1]  owners HASH   KEYS[2] in-flight ZSET of their queue
-- KEYS[3..] the stop STRING of each task in ARGV[2..], in the same order
-- ARGV[1]  the call's JSON record (queues/worker/calls.py renew_call): worker (its id),
--          lease_ms (the lease, counted from now)
-- ARGV[2..] task ids
-- Returns  one flag per task: 1 when renewed, 2 when renewed and asked to stop, 0 when the
--          worker no longer holds it.
--! include _leases
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local call = cjson.decode(ARGV[1])
local ids, mine = held_tasks(KEYS[1], KEYS[2], call.worker, 2)
local held, renewed = {}, {}
for index, id in ipairs(ids) do
    if mine[index] then
        held[index] = redis.call('EXISTS', KEYS[2 + index]) == 1 and 2 or 1
        renewed[#renewed + 1] = now + call.lease_ms
        renewed[#renewed + 1] = id
    else
        held[index] = 0
    end
end
if #renewed > 0 then
    redis.call('ZADD', KEYS[2], 'XX', unpack(renewed))
end
return held
