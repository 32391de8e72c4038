-- Keys that go once idle (included by the semaphore scripts).

-- How long a semaphore's keys outlive the last lease written to them.
local IDLE_MS = 60000

-- Let `key` live at least `ms` more (never shortened; a key of an earlier build without a
-- TTL gets one), so that it expires once every lease in it has ended and it sat idle.
local function keep_for_at_least(key, ms)
    local left = redis.call('PTTL', key)
    if left == -1 or (left >= 0 and left < ms) then
        redis.call('PEXPIRE', key, ms)
    end
end
