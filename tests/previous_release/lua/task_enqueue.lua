-- Store a task message and queue it now, or schedule it for later, by the server's clock.
-- Two shapes. Now (what most producers send, the shortest call):
-- KEYS[1]  messages HASH (task id -> message JSON)   KEYS[2] ready ZSET of the queue (task ids)
-- KEYS[3]  queues HASH of the group (queue name -> its counter)
-- KEYS[4]  wake LIST of the group (workers)   KEYS[5] idle ZSET of the group
-- ARGV[1]  task id   ARGV[2] message JSON   ARGV[3] queue name
-- ARGV[4]  priority, -100..100 (higher runs first)   ARGV[5] wake-up token lifetime, ms
-- ARGV[6]  how long the group's list of queues outlives its last task, ms
-- Now or later (seven keys):
-- KEYS[1]  messages HASH   KEYS[2] ready ZSET   KEYS[3] delayed ZSET of the queue (task id ->
--          due time, ms)   KEYS[4] queues HASH   KEYS[5] wake LIST
-- KEYS[6]  schedule LIST of the group (wakes delayed-task pollers)   KEYS[7] idle ZSET
-- ARGV[1]  task id   ARGV[2] message JSON   ARGV[3] queue name   ARGV[4] delay, ms (0: now)
-- ARGV[5]  wake-up token lifetime, ms
-- ARGV[6]  how long the group's list of queues outlives its last task, ms
-- ARGV[7]  due time, ms since the epoch on this server's clock (0: use the delay)
-- ARGV[8]  priority, -100..100 (higher runs first; delayed tasks read it from the message)
-- Unique (eight keys): the seven above, then
-- KEYS[8]  results HASH of the group (it holds the claims of unique tasks, see _unique)
-- ARGV[9]  the claim's field ('u:<sha256>', also in the message as "unique")
-- ARGV[10] how long the claim lasts at most, ms
-- Returns  1, or 2 when the group's list of queues was created by this call (the producer
--          then records the group in the registry pollers read); in the unique form, the
--          id of the task holding the claim instead, when one does (nothing is queued)
--! include _enqueue
--! include _unique
if #KEYS == 5 then
    local created = enqueue_now(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[3],
        tonumber(ARGV[6]), ARGV[1], ARGV[2], tonumber(ARGV[4]), ARGV[5])
    return created and 2 or 1
end
if #KEYS == 8 then
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local holder = unique_holder(KEYS[8], KEYS[1], ARGV[9], now)
    if holder then
        return holder
    end
    unique_claim(KEYS[8], ARGV[9], ARGV[1], now, tonumber(ARGV[10]))
end
return enqueue_task(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[1],
    ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
