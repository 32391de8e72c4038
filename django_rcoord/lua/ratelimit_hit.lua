-- Count one hit in a fixed window that starts at the window's first hit.
-- KEYS[1]  counter STRING (expires when the window ends)
-- ARGV[1]  window length, ms
-- Returns  {hits in this window including this one, ms until the window ends}
-- INCR and PEXPIRE in one step: no window can be left without an expiry (which would
-- block its key forever) if the caller dies between the two, as with two commands.
local hits = redis.call('INCR', KEYS[1])
local remaining = redis.call('PTTL', KEYS[1])
if remaining < 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
    remaining = tonumber(ARGV[1])
end
return {hits, remaining}
