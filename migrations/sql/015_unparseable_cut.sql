-- A frame that does not parse is kept for inspection only up to its
-- listener's keep_unparseable bytes; size stays the length received. cut_at
-- is how many bytes of the body were kept when it was cut, NULL when the
-- whole body was kept.
ALTER TABLE mefor_message ADD COLUMN cut_at integer;
