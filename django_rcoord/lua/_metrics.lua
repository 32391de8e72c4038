-- The group's task metrics: task_finish.lua's third step. The metrics HASH (its fields:
-- see task_finish.lua) counts each finished run under its record's labels
-- ('queue<US>task', '' for none), by outcome and duration bucket.
--! include _records

local US = '\31'

-- Count the held ones among `tasks`, summed per field over the batch (one command per
-- distinct field), and each queue's finished runs in this minute's slot (a ring of 60
-- fields per queue, each 'minute:count'). `keep`: how long the group's keys live past
-- its last task, ms.
local function count_runs(metrics, tasks, held, now, keep)
    local counted, per_minute = {}, {}
    for position, task in ipairs(tasks) do
        local labels = task.labels
        if held[position] and labels ~= '' then
            if task.outcome == 'later' then
                local held_back = 'h' .. US .. labels
                counted[held_back] = (counted[held_back] or 0) + 1
            else
                local runs = 'n' .. US .. labels .. US .. task.outcome .. US .. task.bucket
                local spent = 's' .. US .. labels .. US .. task.outcome
                counted[runs] = (counted[runs] or 0) + 1
                counted[spent] = (counted[spent] or 0) + task.us
                local queue = string.match(labels, '^[^\31]*')
                per_minute[queue] = (per_minute[queue] or 0) + 1
            end
        end
    end
    for field, amount in pairs(counted) do
        redis.call('HINCRBY', metrics, field, amount)
    end
    local minute = math.floor(now / 60000)
    for queue, amount in pairs(per_minute) do
        local slot = 'm' .. US .. queue .. US .. (minute % 60)
        local at, seen = string.match(redis.call('HGET', metrics, slot) or '', '^(%d+):(%d+)$')
        if tonumber(at) == minute then
            redis.call('HSET', metrics, slot, minute .. ':' .. (tonumber(seen) + amount))
        else
            redis.call('HSET', metrics, slot, minute .. ':' .. amount)
            -- As long as the group's other keys past its last task.
            redis.call('PEXPIRE', metrics, keep + GROUP_KEYS_MS)
        end
    end
end
