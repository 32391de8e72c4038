-- Give back tasks a worker took but will not run (it is stopping, or they waited behind a
-- long task): they go back to the front of their priority in their queue at once, in the
-- order given, not counted as lost deliveries, their records READY again without this
-- worker's attempt; an idle worker is woken for them.
-- KEYS[1]  owners HASH   KEYS[2] in-flight ZSET of their queue
-- KEYS[3]  record prefix of the group (`rcoord:queue:{<group>}:r:`, no key of its own)
-- Builds   KEYS[3] .. <task id>: each task's record HASH (see _records; not written here: a
--          task given back is not finished)
-- KEYS[4]  ready ZSET of their queue   KEYS[5] queues HASH of the group (queue counters)
-- KEYS[6]  messages HASH (priorities)   KEYS[7] incoming LIST (wakes idle workers)   KEYS[8] idle ZSET of the group
-- KEYS[9]  results HASH of the group (<id> -> the state of a queued or running task, see
--          _records)
-- Builds   KEYS[4] .. ' key:<fair key>', KEYS[4] .. ' heads', KEYS[4] .. ' waiting',
--          KEYS[4] .. ' running': the lines of the queue's fair keys (see _ready)
-- ARGV[1]  the call's JSON record (queues/worker/calls.py give_back_call): worker (its id),
--          queue (the queue's name in its group), keep_ms (how long the group's list of
--          queues outlives its last task)
-- ARGV[2..] task ids
-- Returns  how many were given back (the others this worker no longer held).
--! include _ready
--! include _records
--! include _leases
--! include _in_flight
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local call = cjson.decode(ARGV[1])
local ids, held = held_tasks(KEYS[1], KEYS[2], call.worker, 2)
local mine = {}
for index, id in ipairs(ids) do
    if held[index] then
        mine[#mine + 1] = id
    end
end
if #mine == 0 then
    return 0
end
take_out_of_flight(KEYS[2], KEYS[1], mine)
-- Their states are this release's: their taking wrote them (one HMGET, one HSET).
local states = load_live_states(KEYS[9], mine)
for _, state in ipairs(states) do
    state[1] = 'READY'
    drop_last_delivery(state)  -- this worker's
end
save_live_states(KEYS[9], mine, states)
local priorities, fair_keys, fair_limits = priorities_of(KEYS[6], mine)
ready_add(KEYS[4], KEYS[5], call.queue, call.keep_ms, mine, priorities, true, fair_keys)
-- After they are lined up: a key that was at its limit admits the first of its line.
fair_runs_ended(KEYS[4], KEYS[5], call.queue, fair_keys, fair_limits)
if #redis.call('ZRANGEBYSCORE', KEYS[8], now, '+inf', 'LIMIT', 0, 1) > 0 then
    wake_workers(KEYS[7])
end
return #mine
