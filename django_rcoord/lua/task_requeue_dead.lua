-- Move the oldest dead letters of a queue (at most the call's batch) back to the end of their priority
-- in the queue, with fresh retries. A unique task takes its claim back (see _unique) for as
-- long as its message says ("unique_ms"), from now, unless another run of it holds the
-- claim: that run keeps it (a new enqueue answers its id), and both run.
-- KEYS[1]  dead LIST   KEYS[2] ready ZSET   KEYS[3] failures HASH   KEYS[4] errors HASH
-- KEYS[5]  incoming LIST of the group (wakes idle workers)   KEYS[6] results HASH of the group (requeued: its state
--          READY again there, see _records; the unique claims)
-- KEYS[7]  record prefix of the group (`rcoord:queue:{<group>}:r:`, no key of its own)
-- Builds   KEYS[7] .. <task id>: each task's record HASH (see _records: requeued, it keeps
--          its errors only, no longer expiring; KEYS[6] holds the records a previous release
--          wrote)
-- KEYS[8]  messages HASH (priorities, claims)   KEYS[9] queues HASH of the group (counters)
-- KEYS[10] results expiry ZSET of a previous release (a record of its own that is requeued
--          no longer expires there)
-- Builds   KEYS[2] .. ' key:<fair key>', KEYS[2] .. ' heads', KEYS[2] .. ' waiting',
--          KEYS[2] .. ' running': the lines of the queue's fair keys (see _ready)
-- ARGV[1]  the call, JSON (queues/records.py): queue (the queue's name within its group),
--          keep_ms (how long the group's list of queues outlives its last task, ms), batch
--          (most dead letters to move), id (the id of the one dead letter to move; '': the
--          oldest)
-- Returns  how many tasks were requeued (fewer than the batch: none are left).
--! include _ready
--! include _records
--! include _unique
--! include _dead
local call = cjson.decode(ARGV[1])
local ids = dead_letters(KEYS[1], call)
local moved = #ids
if moved > 0 then
    local priorities, fair_keys = priorities_of(KEYS[8], ids)
    ready_add(KEYS[2], KEYS[9], call.queue, call.keep_ms, ids, priorities, false, fair_keys)
    for _, id in ipairs(ids) do
        redis.call('HDEL', KEYS[3], id, id .. ':lost')
        local state = load_finished_state(KEYS[7], KEYS[6], id)
        if state[1] ~= '' then
            state[1] = 'READY'
            save_state(KEYS[7], KEYS[6], id, state)
            reopen_record(KEYS[7], id)
            -- A previous release's record: its state is READY where it was, the rest goes.
            redis.call('HDEL', KEYS[6], id .. ':v', id .. ':m')
        end
    end
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local messages = redis.call('HMGET', KEYS[8], unpack(ids))
    for index, id in ipairs(ids) do
        local field, ms = unique_field(messages[index])
        if field and ms and ms > 0 then
            local holder = unique_holder(KEYS[6], KEYS[8], field, now)
            if not holder or holder == id then
                unique_claim(KEYS[6], field, id, now, ms)
            end
        end
    end
    redis.call('HDEL', KEYS[4], unpack(ids))
    redis.call('ZREM', KEYS[10], unpack(ids))
    trim_dead(KEYS[1], call, moved)
end
if moved > 0 then
    wake_workers(KEYS[5])
end
return moved
