-- Leases (included by the scripts that renew and give back tasks).

-- The task ids in ARGV from position `first` on, and for each whether worker `worker` still
-- holds it: its owner in the HASH `owners` and its lease in the in-flight ZSET `in_flight`.
local function held_tasks(owners, in_flight, worker, first)
    local ids = {}
    for index = first, #ARGV do
        ids[#ids + 1] = ARGV[index]
    end
    local owned = redis.call('HMGET', owners, unpack(ids))
    local leases = redis.call('ZMSCORE', in_flight, unpack(ids))
    local held = {}
    for index = 1, #ids do
        held[index] = owned[index] == worker and leases[index] ~= false
    end
    return ids, held
end
