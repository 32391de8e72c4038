-- Unique tasks (included by the scripts that queue, finish, recover, cancel and requeue
-- tasks). A claim is a field of the group's results HASH: 'u:<sha256>' -> '<task id>|<until,
-- ms>'; the message of the task holding it names the field ("unique": "u:...") and how
-- long a claim of it lasts ("unique_ms").
--! include _variadic

-- The id of the task holding claim `field` in `results`, or nil: a claim past its time (ms,
-- server clock `now`), or whose task's message is gone from `messages`, holds nothing.
local function unique_holder(results, messages, field, now)
    local claim = redis.call('HGET', results, field)
    if not claim then
        return nil
    end
    local id, until_ms = string.match(claim, '^(.*)|(%d+)$')
    if id and tonumber(until_ms) > now and redis.call('HEXISTS', messages, id) == 1 then
        return id
    end
    return nil
end

-- Claim `field` in `results` for task `id` for `ms` from `now`; `results` lives at least
-- that long.
local function unique_claim(results, field, id, now, ms)
    redis.call('HSET', results, field, id .. '|' .. string.format('%.0f', now + ms))
    if redis.call('PTTL', results) < ms then
        redis.call('PEXPIRE', results, ms)
    end
end

-- The claim field message `message` names and how long a claim of it lasts (ms; nil when
-- the message does not say), or nil (most messages name none: one search).
local function unique_field(message)
    if not message or not string.find(message, '"unique"', 1, true) then
        return nil
    end
    local ok, decoded = pcall(cjson.decode, message)
    local field = ok and type(decoded) == 'table' and decoded.unique
    if type(field) == 'string' and string.sub(field, 1, 2) == 'u:' then
        return field, tonumber(decoded.unique_ms)
    end
    return nil
end

-- The tasks `ids` (their messages in `messages`, by id) ended: drop the claim of each that
-- still holds one (a claim past its time may have been taken over by a later task of the
-- same key), with one HMGET and one HDEL for them all.
local function unique_release_all(results, ids, messages)
    local fields, holders = {}, {}
    for _, id in ipairs(ids) do
        local field = unique_field(messages[id])
        if field then
            fields[#fields + 1] = field
            holders[#holders + 1] = id
        end
    end
    if #fields == 0 then
        return
    end
    local claims = in_chunks('HMGET', results, fields)
    local held = {}
    for index, field in ipairs(fields) do
        local claim, id = claims[index], holders[index]
        if claim and string.sub(claim, 1, #id + 1) == id .. '|' then
            held[#held + 1] = field
        end
    end
    if #held > 0 then
        in_chunks('HDEL', results, held)
    end
end

-- Task `id` (its message `message`) ended: drop its claim, if it still holds it.
local function unique_release(results, id, message)
    unique_release_all(results, {id}, {[id] = message})
end
