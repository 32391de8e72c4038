-- The group's task metrics: task_finish.lua's third step. The metrics HASH (its fields:
-- see task_finish.lua) counts each finished run under its record's labels
-- ('queue<US>task', '' for none), by outcome and duration bucket.
--! include _records

local US = '\31'

-- The fields one run of `labels` ending with `outcome` in duration bucket `bucket` counts
-- under ({runs, time spent, its queue's name}; held back: {held back}), built once a call
-- for each such run: the runs of a batch mostly share them, and building a field costs
-- more than counting it.
local function run_fields(cache, labels, outcome, bucket)
    local by_outcome = cache[labels]
    if not by_outcome then
        by_outcome = {}
        cache[labels] = by_outcome
    end
    local by_bucket = by_outcome[outcome]
    if not by_bucket then
        by_bucket = {}
        by_outcome[outcome] = by_bucket
    end
    local fields = by_bucket[bucket]
    if not fields then
        if outcome == 'later' then
            fields = {'h' .. US .. labels}
        else
            fields = {
                'n' .. US .. labels .. US .. outcome .. US .. bucket,
                's' .. US .. labels .. US .. outcome,
                string.match(labels, '^[^\31]*'),
            }
        end
        by_bucket[bucket] = fields
    end
    return fields
end

-- Count the held ones among `tasks`, summed per field over the batch (one command per
-- distinct field), and each queue's finished runs in this minute's slot (a ring of 60
-- fields per queue, each 'minute:count'). `keep`: how long the group's keys live past
-- its last task, ms.
local function count_runs(metrics, tasks, held, now, keep)
    local counted, per_minute, cache = {}, {}, {}
    for position, task in ipairs(tasks) do
        local labels = task.labels
        if held[position] and labels ~= '' then
            local fields = run_fields(cache, labels, task.outcome, task.bucket)
            local runs = fields[1]
            counted[runs] = (counted[runs] or 0) + 1
            if fields[2] then
                local spent, queue = fields[2], fields[3]
                counted[spent] = (counted[spent] or 0) + task.us
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
