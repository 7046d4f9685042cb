"""The Lua script that applies ledger batches inside Redis: one round trip per flush, atomic per call,
idempotent by the (source, seq, ts) marker of each batch. The marker is checked first and set last, and
every operation is idempotent, so a script cut short by an error (READONLY after a failover, OOM under
`maxmemory`) changes nothing that a retry of the same batch would not redo the same way.

Redis layout under the prefix P:
  P..applied:<source>:<seq>:<ts>  marker, expires after a day
  P..rec       HASH id -> msgpack [source, medium, hash, parent, tenant, epoch, stored_at, removed_at,
               closed_by, policy_version, copies, unknown_since]  (epoch -1 = none, removed_at -1 = resident,
               unknown_since -1 = known; records written before copies/unknown_since have 10 fields)
  P..open:<source>  HASH medium \\x1f hash -> id   (resident records of a source)
  P..ids       counter for record ids
  P..cursors   HASH source -> msgpack [seq, ts]
  P..events    HASH source \\x1f kind \\x1f boundary -> msgpack [source, kind, boundary, learned_at, closed]
Batches arrive as msgpack [[source, seq, ts_text, policy_version, ops], ...]; ops are
  [1, medium, hash, parent, tenant, epoch, stored_at]   open
  [2, medium, hash, removed_at]                          close
  [3, media_csv, stored_before, at, reason]              clear ("" = every medium, -1 = no time bound)
  [4, medium, hash, copies]                              copy count of an open record
  [5, since]                                             silence: open records become unknown
  [6, at]                                                resume: unknown records are resident again
msgpack arrays with nil break Lua tables, hence the -1 and "" stand-ins.
"""

APPLY_LUA = r"""
local prefix = ARGV[1]
local ttl = tonumber(ARGV[2])
local batches = cmsgpack.unpack(ARGV[3])
local SEP = "\31"
local REC = prefix .. "rec"

local function update_record(id, index, value)
  local packed = redis.call("HGET", REC, id)
  if not packed then return end
  local rec = cmsgpack.unpack(packed)
  if rec[11] == nil then rec[11] = 1 end
  if rec[12] == nil then rec[12] = -1 end
  rec[index] = value
  redis.call("HSET", REC, id, cmsgpack.pack(rec))
end

local function close_record(id, at, reason)
  local packed = redis.call("HGET", REC, id)
  if not packed then return end
  local rec = cmsgpack.unpack(packed)
  rec[8] = at
  rec[9] = reason
  redis.call("HSET", REC, id, cmsgpack.pack(rec))
end

local function add_event(source, kind, boundary, at, count)
  local key = source .. SEP .. kind .. SEP .. boundary
  redis.call("HSETNX", prefix .. "events", key, cmsgpack.pack({source, kind, tonumber(boundary), at, count}))
end

local function open_block(source, version, op)
  local openkey = prefix .. "open:" .. source
  local field = op[2] .. SEP .. op[3]
  if redis.call("HEXISTS", openkey, field) == 1 then return end
  local id = tostring(redis.call("INCR", prefix .. "ids"))
  redis.call("HSET", REC, id, cmsgpack.pack({source, op[2], op[3], op[4], op[5], op[6], op[7], -1, "",
                                              version, 1, -1}))
  redis.call("HSET", openkey, field, id)
end

local function close_block(source, op)
  local openkey = prefix .. "open:" .. source
  local field = op[2] .. SEP .. op[3]
  local id = redis.call("HGET", openkey, field)
  if not id then return end
  close_record(id, op[4], "removed")
  redis.call("HDEL", openkey, field)
end

local function set_copies(source, op)
  local id = redis.call("HGET", prefix .. "open:" .. source, op[2] .. SEP .. op[3])
  if id then update_record(id, 11, op[4]) end
end

local function mark_unknown(source, boundary, op, value)
  local pairs_ = redis.call("HGETALL", prefix .. "open:" .. source)
  local changed = 0
  for i = 1, #pairs_, 2 do
    local packed = redis.call("HGET", REC, pairs_[i + 1])
    if packed then
      local current = cmsgpack.unpack(packed)[12] or -1
      if (value < 0) ~= (current < 0) then
        update_record(pairs_[i + 1], 12, value)
        changed = changed + 1
      end
    end
  end
  add_event(source, value < 0 and "resumed" or "silent", boundary, op[2], changed)
end

local function in_media(media_csv, field)
  if media_csv == "" then return true end
  local medium = string.sub(field, 1, string.find(field, SEP, 1, true) - 1)
  for name in string.gmatch(media_csv, "[^,]+") do
    if name == medium then return true end
  end
  return false
end

local function stored_before(id, bound)
  local packed = redis.call("HGET", REC, id)
  return packed ~= false and cmsgpack.unpack(packed)[7] < bound
end

local function clear_blocks(source, boundary, op)
  local openkey = prefix .. "open:" .. source
  local pairs_ = redis.call("HGETALL", openkey)
  local closed = 0
  for i = 1, #pairs_, 2 do
    local field, id = pairs_[i], pairs_[i + 1]
    if in_media(op[2], field) then
      if op[3] < 0 or stored_before(id, op[3]) then
        close_record(id, op[4], op[5])
        redis.call("HDEL", openkey, field)
        closed = closed + 1
      end
    end
  end
  if op[5] == "restart" or op[5] == "restart_presumed" or op[5] == "lost" or op[5] == "reset" then
    add_event(source, op[5], boundary, op[4], closed)
  end
end

local function advance_cursor(source, seq, ts)
  local current = redis.call("HGET", prefix .. "cursors", source)
  if current then
    local c = cmsgpack.unpack(current)
    if ts < c[2] or (ts == c[2] and seq <= c[1]) then return end
  end
  redis.call("HSET", prefix .. "cursors", source, cmsgpack.pack({seq, ts}))
end

local results = {}
for b = 1, #batches do
  local batch = batches[b]
  local source, seq, ts_text, version, ops = batch[1], batch[2], batch[3], batch[4], batch[5]
  local marker = prefix .. "applied:" .. source .. ":" .. seq .. ":" .. ts_text
  if redis.call("EXISTS", marker) == 0 then
    for o = 1, #ops do
      local op = ops[o]
      if op[1] == 1 then open_block(source, version, op)
      elseif op[1] == 2 then close_block(source, op)
      elseif op[1] == 3 then clear_blocks(source, ts_text, op)
      elseif op[1] == 4 then set_copies(source, op)
      elseif op[1] == 5 then mark_unknown(source, ts_text, op, op[2])
      else mark_unknown(source, ts_text, op, -1) end
    end
    if seq >= 0 then advance_cursor(source, seq, tonumber(ts_text)) end
    redis.call("SET", marker, "1", "EX", ttl)
    results[b] = 1
  else
    results[b] = 0
  end
end
return results
"""

REMEMBER_SALTS_LUA = r"""
local prefix = ARGV[1]
local entries = cmsgpack.unpack(ARGV[2])
for i = 1, #entries do
  if redis.call("SADD", prefix .. "salt_set", entries[i][3]) == 1 then
    redis.call("RPUSH", prefix .. "salts", cmsgpack.pack(entries[i]))
  end
end
return #entries
"""
