-- The keys of the tasks in flight: each queue's in-flight ZSET (id -> lease end) and the
-- group's owners HASH (id -> worker id). While they hold tasks, each also holds one member
-- longer than the 64 bytes a listpack takes by default (at score +inf in the ZSET: never
-- due, never counted; '' in the HASH, like a task given back), which keeps it in its large
-- encoding. A listpack answers each lookup by a scan: with 32 to 448 tasks in flight (a
-- worker holds 32) the take and the finish spent 3 to 12 times as long in these two keys as
-- with a skiplist and a hashtable (docs/explanation/benchmarks.md, "Tasks in flight and the
-- listpack encoding"). The scripts that take tasks out of them delete a key once that
-- member is all it holds: the keys go with their last task, and have no expiry.
local LARGE_ENCODING = '~ keeps this key in its large encoding: a lookup in a listpack is a scan ~'

-- Delete the in-flight ZSET `in_flight` when the long member is all it holds.
local function drop_emptied_in_flight(in_flight)
    if redis.call('ZCARD', in_flight) == 1 and redis.call('ZSCORE', in_flight, LARGE_ENCODING) then
        redis.call('DEL', in_flight)
    end
end

-- Delete the owners HASH `owners` when the long member is all it holds.
local function drop_emptied_owners(owners)
    if redis.call('HLEN', owners) == 1 and redis.call('HEXISTS', owners, LARGE_ENCODING) == 1 then
        redis.call('DEL', owners)
    end
end

-- Take the tasks `ids` out of the in-flight ZSET `in_flight` and the owners HASH `owners`,
-- and drop either key that holds only the long member then.
local function take_out_of_flight(in_flight, owners, ids)
    redis.call('ZREM', in_flight, unpack(ids))
    redis.call('HDEL', owners, unpack(ids))
    drop_emptied_in_flight(in_flight)
    drop_emptied_owners(owners)
end
