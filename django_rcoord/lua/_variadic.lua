-- Variadic commands of any length (included by the scripts that take, finish and recover
-- tasks in batches): one command for many members, in parts Lua can pass.

-- Members per variadic call: Lua's unpack takes some 8,000 values at most (an even
-- number, so that a field and its value stay in one call).
local CHUNK = 1000

-- Run `command` on `key` with the flat list `items`, CHUNK of them a call at most; returns
-- the replies of a reading command (HMGET, ZMSCORE), concatenated in order.
local function in_chunks(command, key, items)
    local replies = {}
    for first = 1, #items, CHUNK do
        local reply = redis.call(command, key, unpack(items, first, math.min(#items, first + CHUNK - 1)))
        if type(reply) == 'table' then
            for index = 1, #reply do
                replies[#replies + 1] = reply[index]
            end
        end
    end
    return replies
end
