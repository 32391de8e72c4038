-- Dead letters a call names (included by task_requeue_dead and task_delete_dead), the call
-- a JSON record with `id` (one letter's id, or '') and `batch` (most letters, the oldest).

-- The letters of the dead LIST `dead` the call names: the one `call.id` names (out of the
-- list now, when it is there), or the oldest `call.batch`, read only: trim_dead drops them
-- once the caller has written what becomes of them (Redis does not undo a script's writes
-- when a later command fails: a letter is never dropped before it is moved).
local function dead_letters(dead, call)
    if call.id ~= '' then
        return redis.call('LREM', dead, 1, call.id) == 1 and {call.id} or {}
    end
    return redis.call('LRANGE', dead, 0, call.batch - 1)
end

-- Drop the `count` oldest letters dead_letters read (nothing for one named by its id).
local function trim_dead(dead, call, count)
    if call.id == '' and count > 0 then
        redis.call('LTRIM', dead, count, -1)
    end
end
