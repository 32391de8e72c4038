-- Ready queues (included by the scripts that queue tasks). A queue's ready tasks are a ZSET
-- ordered by priority, then by arrival: score = (100 - priority) * 2^45 + seq, where seq is
-- the queue's own counter (a field of the group's queues HASH). A task put back after its
-- worker's lease ran out goes to the front of its priority: seq - 2^44. Every score is an
-- integer below 2^53, exact in a double.
-- Fair queues: a task whose message names a "fair_key" (encoded: no brace, no space) waits
-- in its key's line; the ready ZSET holds one task of each key, its head (the key's highest
-- priority, then oldest). When the take (or cancel) takes a head, the key's next task joins
-- the ready ZSET behind the tasks already ready at its priority (a fresh seq): the keys are
-- served round-robin. Four keys per queue, built from its ready ZSET's name (a space
-- cannot be in a queue's key part, encoded: they spell no other queue's keys):
-- `<ready> key:<fair key>` ZSET, the key's tasks behind its head (scored as in `ready`);
-- `<ready> heads` HASH, 'k:<fair key>' -> its head's id and 'i:<head id>' -> its key;
-- `<ready> waiting` STRING, how many tasks wait behind heads (queue_stats adds them);
-- `<ready> running` HASH, fair key -> its tasks taken and not ended, for a key whose tasks
-- carry a limit ("fair_limit", max_running_per_key): at its limit, the key's head is ''
-- (blocked) and its next task waits in its line until one of its runs ends (fair_ended).
-- Builds   ready .. ' key:<fair key>', ready .. ' heads', ready .. ' waiting', ready ..
--          ' running' (`ready`: a queue's ready ZSET as its caller gives it)
local READY_BAND = 35184372088832
local READY_FRONT = 17592186044416
local FAIR_FIELD = '"fair_key"'

-- The fair key a task message names (nil: none, or unreadable), and its key's limit of
-- running tasks (nil: none). A plain search first: a message without one (most) is not
-- decoded.
local function message_fair_key(message)
    if not message or not string.find(message, FAIR_FIELD, 1, true) then
        return nil
    end
    local ok, decoded = pcall(cjson.decode, message)
    local key = ok and type(decoded) == 'table' and decoded.fair_key
    if type(key) ~= 'string' or key == '' then
        return nil
    end
    return key, tonumber(decoded.fair_limit)
end

-- One task fewer waits behind the heads of `ready` (the count goes with the last one).
local function fair_waiting_less(ready)
    if redis.call('DECR', ready .. ' waiting') <= 0 then
        redis.call('DEL', ready .. ' waiting')
    end
end

-- The priority band of a ready score (100 - priority), front or back.
local function band_of(score)
    return math.floor((tonumber(score) + READY_FRONT) / READY_BAND)
end

-- Make `id` the head of key `key` in `ready` (scored `score`), in the `heads` HASH.
local function fair_head(ready, heads, key, id, score)
    redis.call('HSET', heads, 'k:' .. key, id, 'i:' .. id, key)
    redis.call('ZADD', ready, score, id)
end

-- Line task `id` of key `key` up (its ready score `score`, a string): the key's head, in
-- `ready` now, when the key has none there; else behind it, in the key's line, unless it
-- has a higher priority: then it is the head, and the head waits first in the line.
local function fair_add(ready, key, id, score)
    local heads = ready .. ' heads'
    local head = redis.call('HGET', heads, 'k:' .. key)
    local head_score = head and head ~= '' and redis.call('ZSCORE', ready, head)
    if head == '' then
        -- The key is at its limit of running tasks: its line waits (fair_ended).
        redis.call('ZADD', ready .. ' key:' .. key, score, id)
        redis.call('INCR', ready .. ' waiting')
        return
    end
    if not head_score then
        -- No head, or one a previous release took without moving the line: this task is.
        if head then
            redis.call('HDEL', heads, 'i:' .. head)
        end
        fair_head(ready, heads, key, id, score)
        return
    end
    local line = ready .. ' key:' .. key
    if band_of(score) < band_of(head_score) then
        redis.call('ZREM', ready, head)
        redis.call('HDEL', heads, 'i:' .. head)
        redis.call('ZADD', line, head_score, head)
        fair_head(ready, heads, key, id, score)
    else
        redis.call('ZADD', line, score, id)
    end
    redis.call('INCR', ready .. ' waiting')
end

-- The next task of key `key`'s line joins `ready` as its head, behind the tasks ready at
-- its priority (a fresh seq: field `queue` of the HASH `queues`); with none, the key has
-- no head. Returns true when a task joined.
local function fair_admit(ready, queues, queue, key)
    local heads = ready .. ' heads'
    local next_up = redis.call('ZPOPMIN', ready .. ' key:' .. key)
    if #next_up == 0 then
        redis.call('HDEL', heads, 'k:' .. key)
        return false
    end
    fair_waiting_less(ready)
    local score = band_of(next_up[2]) * READY_BAND + redis.call('HINCRBY', queues, queue, 1)
    fair_head(ready, heads, key, next_up[1], string.format('%.0f', score))
    return true
end

-- Task `id` left `ready` (taken, or cancelled): when it was the head of key `key` (nil:
-- look it up, the task's message is gone), the key's next task joins `ready`
-- (fair_admit), unless `limit` (taken: its key's limit of running tasks, nil for none) is
-- reached: then the key is blocked (its head '') until one of its runs ends. Returns true
-- when a task joined.
local function fair_advance(ready, queues, queue, key, id, limit)
    local heads = ready .. ' heads'
    -- Counted whether or not it was the head: fair_ended counts each run's end.
    local blocked = limit and redis.call('HINCRBY', ready .. ' running', key, 1) >= limit
    key = key or redis.call('HGET', heads, 'i:' .. id)
    if not key or redis.call('HGET', heads, 'k:' .. key) ~= id then
        return false
    end
    redis.call('HDEL', heads, 'i:' .. id)
    if blocked then
        redis.call('HSET', heads, 'k:' .. key, '')
        return false
    end
    return fair_admit(ready, queues, queue, key)
end

-- A run of key `key`, which has a limit of running tasks, ended (finished, put back, given
-- back, stopped): the key counts one fewer, and a key that was blocked admits its next
-- task (fair_admit).
local function fair_ended(ready, queues, queue, key)
    if redis.call('HINCRBY', ready .. ' running', key, -1) <= 0 then
        redis.call('HDEL', ready .. ' running', key)
    end
    if redis.call('HGET', ready .. ' heads', 'k:' .. key) == '' then
        fair_admit(ready, queues, queue, key)
    end
end

-- Task `id` (of key `key`) leaves its queue (cancelled): out of `ready`, moving its key's
-- line when it was the head, or out of its key's line. Returns true when it was in either.
local function fair_remove(ready, queues, queue, key, id)
    if redis.call('ZREM', ready, id) == 1 then
        fair_advance(ready, queues, queue, key, id)
        return true
    end
    if redis.call('ZREM', ready .. ' key:' .. key, id) == 1 then
        fair_waiting_less(ready)
        return true
    end
    return false
end

-- The priority a task message carries (-100..100; 0 when it names none or is unreadable).
local function message_priority(message)
    if not message or not string.find(message, '"priority"', 1, true) then
        return 0
    end
    local ok, decoded = pcall(cjson.decode, message)
    local priority = ok and type(decoded) == 'table' and tonumber(decoded.priority)
    if not priority or priority < -100 or priority > 100 then
        return 0
    end
    return math.floor(priority)
end

-- The priorities of the tasks `ids` (at least one), read from their messages in `messages`,
-- their fair keys ({[index] = key} for those that have one) and their keys' limits of
-- running tasks ({[index] = limit} for those that have one).
local function priorities_of(messages, ids)
    local bodies = redis.call('HMGET', messages, unpack(ids))
    local priorities, fair_keys, fair_limits = {}, {}, {}
    for index = 1, #ids do
        priorities[index] = message_priority(bodies[index])
        fair_keys[index], fair_limits[index] = message_fair_key(bodies[index])
    end
    return priorities, fair_keys, fair_limits
end

-- Runs of queue `queue` put back on `ready` ended (fair_ended for each of those whose key
-- has a limit, `fair_keys` and `fair_limits` as priorities_of returns them).
local function fair_runs_ended(ready, queues, queue, fair_keys, fair_limits)
    for index, limit in pairs(fair_limits) do
        if limit and fair_keys[index] then
            fair_ended(ready, queues, queue, fair_keys[index])
        end
    end
end

-- Queue the tasks `ids` (at least one, in this order; `priorities` theirs) on the ready ZSET
-- `ready` of queue `queue` (its counter in the HASH `queues`, kept at least `keep_ms`), at
-- the back of their priority, or at the front. One counter step and one ZADD for them all;
-- a task with a fair key (`fair_keys`, as priorities_of returns them; nil: none has) joins
-- its key's line (fair_add). Returns true when this call created `queues` (the group is
-- new, or was lost).
local function ready_add(ready, queues, queue, keep_ms, ids, priorities, front, fair_keys)
    local count = #ids
    local first = redis.call('HINCRBY', queues, queue, count) - count
    local ttl = redis.call('PTTL', queues)
    if ttl < keep_ms then
        redis.call('PEXPIRE', queues, keep_ms)
    end
    local members = {}
    for index = 1, count do
        local score = (100 - priorities[index]) * READY_BAND + first + index
        if front then
            score = score - READY_FRONT
        end
        local fair_key = fair_keys and fair_keys[index]
        if fair_key then
            fair_add(ready, fair_key, ids[index], string.format('%.0f', score))
        else
            members[#members + 1] = string.format('%.0f', score)
            members[#members + 1] = ids[index]
        end
    end
    if #members > 0 then
        redis.call('ZADD', ready, unpack(members))
    end
    return ttl == -1
end

-- Wake the group's idle workers: they wait on its incoming LIST (`incoming`: a BLMOVE of
-- the list onto itself, which takes nothing), so anything in it wakes them all. A token ('',
-- which the take drops, see _incoming) is pushed only when the list is empty: one is enough.
local function wake_workers(incoming)
    if redis.call('LLEN', incoming) == 0 then
        redis.call('RPUSH', incoming, '')
    end
end

-- Store message `body` of task `id` and queue it now on queue `queue` (keys as in
-- ready_add; `messages` the group's HASH of messages), then wake the workers
-- (wake_workers: `incoming` the group's incoming LIST) if one is registered idle in the ZSET
-- `idle`. A worker leaves `idle` when it takes a task; a registration of a worker that died
-- lingers until another worker registers or the ZSET expires, costing a needless wake-up
-- at most. Returns true when the group's `queues` HASH was created by this call.
local function enqueue_now(messages, ready, queues, incoming, idle, queue, keep_ms, id, body,
                           priority)
    redis.call('HSET', messages, id, body)
    local created = ready_add(ready, queues, queue, keep_ms, {id}, {priority}, false,
        {message_fair_key(body)})
    if redis.call('EXISTS', idle) == 1 then
        wake_workers(incoming)
    end
    return created
end
