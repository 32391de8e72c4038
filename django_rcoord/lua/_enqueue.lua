-- Queue a task message: included by task_enqueue, and by a project's own scripts that queue
-- a task in the same atomic step as their writes (they include django_rcoord:_enqueue;
-- django_rcoord.queues.producer.enqueue_in_script gives them its keys and arguments, in order).
--! include _ready

-- Store message `body` of task `id` and queue it now, or schedule it for later, by the
-- server's clock. Keys: the group's `messages` HASH, the queue's `ready` and `delayed`
-- ZSETs, the group's `queues` HASH, `incoming` LIST (it wakes idle workers), `schedule`
-- LIST (wakes delayed-task pollers) and `idle` ZSET. `queue` is the queue's name within its group; `delay_ms` how
-- long from now (0: now) unless `due_at_ms` (ms since the epoch on this server's clock) is
-- above 0; `wake_ms` the lifetime of wake-up tokens; `keep_ms` how long the group's list
-- of queues outlives its last task; `priority` -100..100 (higher runs first).
-- Returns 1, or 2 when the group's list of queues was created by this call (the producer
-- then records the group in the registry pollers read).
local function enqueue_task(messages, ready, delayed, queues, incoming, schedule, idle, id, body,
                            queue, delay_ms, wake_ms, keep_ms, due_at_ms, priority)
    local delay = tonumber(delay_ms)
    local now = 0
    if delay > 0 or tonumber(due_at_ms) > 0 then
        local time = redis.call('TIME')
        now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
        if tonumber(due_at_ms) > 0 then
            delay = tonumber(due_at_ms) - now
        end
    end
    local keep = math.max(delay, 0) + tonumber(keep_ms)
    if delay <= 0 then
        local created = enqueue_now(messages, ready, queues, incoming, idle, queue, keep, id, body,
            tonumber(priority))
        return created and 2 or 1
    end
    redis.call('HSET', messages, id, body)
    redis.call('HINCRBY', queues, queue, 0)
    local ttl = redis.call('PTTL', queues)
    if ttl < keep then
        redis.call('PEXPIRE', queues, keep)
    end
    redis.call('ZADD', delayed, now + delay, id)
    -- A poller sleeping until a later due time wakes to recompute its sleep.
    redis.call('RPUSH', schedule, 1)
    redis.call('LTRIM', schedule, -16, -1)
    redis.call('PEXPIRE', schedule, wake_ms)
    return ttl == -1 and 2 or 1
end
