"""The text of one turn as OpenAI returns it, built token by token.

The engine stops a turn at the token that completes a stop string and that token's text stays in
the turn; OpenAI's answer ends before the stop sequence. So while a turn streams, text that could
still become the start of a stop string is held back, and when the turn ends on a stop string the
text is cut where it begins. Streamed and non-streamed answers are built by the same object, so a
greedy turn gives the same text both ways.

Stop strings the engine cannot take (from `engine_stops` on: those holding a NUL character, which
the C API's strings cannot carry) are matched here: `server_stop()` says when one has completed, and
the handler then ends the turn itself.
"""


class TurnText:
    def __init__(self, tokenizer, stop_strings, engine_stops=None):
        self._detokenizer = tokenizer.create_stream()
        self._stops = list(stop_strings)
        self._engine_stops = len(self._stops) if engine_stops is None else engine_stops
        self._longest_stop = max((len(s) for s in self._stops), default=0)
        self.tokens = 0          # tokens added so far
        self._text = ""          # everything decoded so far
        self._released = 0       # characters of _text handed out by add()
        self._searched = 0       # characters of _text server_stop() has looked through

    def add(self, token: int) -> str:
        """Decodes one generated token; returns the text that is now safe to send (may be '')."""
        self.tokens += 1
        self._text += self._detokenizer.decode(token)
        safe = min(self._first_stop(), len(self._text) - self._held_back())
        if safe <= self._released:
            return ""
        piece = self._text[self._released:safe]
        self._released = safe
        return piece

    def finish(self, stop_string_index: int) -> str:
        """The rest of the text once the turn ended (stop_string_index >= 0: it ended on that stop
        string, which is cut off with whatever follows it)."""
        end = len(self._text)
        if 0 <= stop_string_index < len(self._stops):
            # The engine ends the turn at the first completed match, so the first occurrence of
            # the matched string is the one that ended it.
            at = self._text.find(self._stops[stop_string_index])
            if at >= 0:
                end = at
        piece = self._text[self._released:end] if end > self._released else ""
        self._released = max(self._released, end)
        return piece

    def server_stop(self) -> int:
        """The index of a stop string matched here (not by the engine) that the text now holds, or -1.
        Text searched before cannot hold a whole one, so the search starts just before its end."""
        found, first = -1, len(self._text)
        for index in range(self._engine_stops, len(self._stops)):
            stop = self._stops[index]
            at = self._text.find(stop, max(0, self._searched - len(stop) + 1))
            if 0 <= at < first:   # of two completed by one token, the one that begins first
                found, first = index, at
        self._searched = len(self._text)
        return found

    def _first_stop(self) -> int:
        """Where the first complete stop string in the text begins (the text's length if none).
        Released text never holds a whole stop string, so the search starts just before its end."""
        first = len(self._text)
        for stop in self._stops:
            at = self._text.find(stop, max(0, self._released - len(stop) + 1))
            if 0 <= at < first:
                first = at
        return first

    def _held_back(self) -> int:
        """Length of the longest end of the text that is a proper start of some stop string."""
        if not self._longest_stop:
            return 0
        text = self._text
        for length in range(min(self._longest_stop - 1, len(text)), 0, -1):
            tail = text[-length:]
            if any(stop.startswith(tail) for stop in self._stops):
                return length
        return 0
