-- Follow-up tasks (on_success / on_failure), queued with the end of the run they follow:
-- task_finish.lua's second step.
-- A finished task's record may carry a list of them, `follow_ups` (its own follow-up, the
-- task that counts it in its fan-in), each with: keys, the position in KEYS of the
-- first of its five keys (enqueue_now's, see _ready, of a queue of this group); id,
-- message, queue (the queue's name in its group), priority, keep_ms (the group keys'
-- lifetime), claim (its unique claim's field, '' for none) and claim_ms (how long the
-- claim lasts).
-- A record may also carry `fan_in`, its count in the fan-in it is a child of when that
-- fan-in's callback is in this group (see _fan_in): keys (the position in KEYS of the
-- fan-in prefix, then the callback queue's five enqueue keys), id, n, value and how.
--! include _ready
--! include _unique
--! include _fan_in

-- Count the fan-in children and queue the follow-ups of the held ones among `tasks` that
-- were acknowledged or made dead letters (one retried runs again: its follow-up waits for its last run). Only a task this
-- worker still held (`held`): else its other run's worker queues them, after its record is
-- final. A follow-up whose unique claim another task holds is not queued.
local function queue_follow_ups(results, tasks, held, now)
    for position, task in ipairs(tasks) do
        local final = held[position] and (task.outcome == 'ack' or task.outcome == 'dead')
        local count = task.fan_in
        if count and final then
            local k = count.keys
            fan_in_count(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4],
                KEYS[k + 5], count.id, count.n, count.value, count.how)
        end
        if task.follow_ups and final then
            for _, step in ipairs(task.follow_ups) do
                local k = step.keys
                if step.claim == '' or not unique_holder(results, KEYS[k], step.claim, now) then
                    if step.claim ~= '' then
                        unique_claim(results, step.claim, step.id, now, step.claim_ms)
                    end
                    enqueue_now(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4],
                        step.queue, step.keep_ms, step.id, step.message, step.priority)
                end
            end
        end
    end
end
