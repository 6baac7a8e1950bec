"""30+ function schemas of the kinds real tool-using apps declare (OpenAI's `tools` format): enums,
bounded and unbounded numbers, booleans, arrays, nested objects, optional fields and string
formats (date, date-time, email, uri, uuid)."""

from __future__ import annotations

from typing import Any


def _fn(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


S = {"type": "string"}
UNIT = {"type": "string", "enum": ["celsius", "fahrenheit"]}

TOOLS: list[dict[str, Any]] = [
    _fn("get_weather", "Current weather in a city", {"city": S, "unit": UNIT}, ["city"]),
    _fn("get_forecast", "Weather forecast", {"city": S, "days": {"type": "integer", "minimum": 1, "maximum": 14}}, ["city", "days"]),
    _fn("search_web", "Search the web", {"query": S, "max_results": {"type": "integer", "minimum": 1, "maximum": 20}}, ["query"]),
    _fn("send_email", "Send an email", {"to": {"type": "string", "format": "email"}, "subject": S, "body": S}, ["to", "subject", "body"]),
    _fn("create_event", "Add a calendar event", {"title": S, "date": {"type": "string", "format": "date"}, "all_day": {"type": "boolean"}}, ["title", "date"]),
    _fn("set_alarm", "Set an alarm", {"hour": {"type": "integer", "minimum": 0, "maximum": 23}, "minute": {"type": "integer", "minimum": 0, "maximum": 59}}, ["hour", "minute"]),
    _fn("convert_currency", "Convert money", {"amount": {"type": "number", "minimum": 0}, "from": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]}, "to": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]}}, ["amount", "from", "to"]),
    _fn("translate", "Translate text", {"text": S, "target_language": {"type": "string", "enum": ["fr", "de", "es", "it", "ja"]}}, ["text", "target_language"]),
    _fn("get_stock_price", "A stock quote", {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}}, ["ticker"]),
    _fn("book_flight", "Book a flight", {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"}, "destination": {"type": "string", "pattern": "^[A-Z]{3}$"}, "date": {"type": "string", "format": "date"}, "passengers": {"type": "integer", "minimum": 1, "maximum": 9}}, ["origin", "destination", "date"]),
    _fn("add_todo", "Add a to-do item", {"task": S, "priority": {"type": "string", "enum": ["low", "medium", "high"]}}, ["task"]),
    _fn("play_music", "Play music", {"artist": S, "shuffle": {"type": "boolean"}}, ["artist"]),
    _fn("get_directions", "Route between places", {"from_address": S, "to_address": S, "mode": {"type": "string", "enum": ["driving", "walking", "transit", "cycling"]}}, ["from_address", "to_address"]),
    _fn("calculate", "Evaluate arithmetic", {"expression": S}, ["expression"]),
    _fn("lookup_user", "Find a user by id", {"user_id": {"type": "string", "format": "uuid"}}, ["user_id"]),
    _fn("fetch_url", "Download a web page", {"url": {"type": "string", "format": "uri"}}, ["url"]),
    _fn("schedule_meeting", "Schedule a meeting", {"attendees": {"type": "array", "items": S, "minItems": 1, "maxItems": 5}, "start": {"type": "string", "format": "date-time"}, "duration_minutes": {"type": "integer", "minimum": 15, "maximum": 240}}, ["attendees", "start"]),
    _fn("order_pizza", "Order a pizza", {"size": {"type": "string", "enum": ["small", "medium", "large"]}, "toppings": {"type": "array", "items": {"type": "string", "enum": ["cheese", "ham", "mushroom", "olive", "pepper"]}, "maxItems": 4}}, ["size"]),
    _fn("set_thermostat", "Set the temperature", {"degrees": {"type": "number", "minimum": 10, "maximum": 30}, "room": S}, ["degrees"]),
    _fn("get_news", "Latest headlines", {"topic": {"type": "string", "enum": ["world", "business", "sports", "science", "tech"]}, "count": {"type": "integer", "minimum": 1, "maximum": 10}}, ["topic"]),
    _fn("rate_movie", "Rate a movie", {"title": S, "stars": {"type": "integer", "minimum": 1, "maximum": 5}}, ["title", "stars"]),
    _fn("create_user", "Create an account", {"name": S, "email": {"type": "string", "format": "email"}, "age": {"type": "integer", "minimum": 13, "maximum": 120}, "newsletter": {"type": "boolean"}}, ["name", "email"]),
    _fn("update_address", "Change a postal address", {"address": {"type": "object", "properties": {"street": S, "city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city", "zip"]}}, ["address"]),
    _fn("log_workout", "Log exercise", {"activity": {"type": "string", "enum": ["run", "swim", "bike", "walk"]}, "minutes": {"type": "integer", "minimum": 1, "maximum": 600}, "distance_km": {"type": "number", "minimum": 0}}, ["activity", "minutes"]),
    _fn("get_time", "Current time in a time zone", {"timezone": S}, ["timezone"]),
    _fn("reserve_table", "Reserve a restaurant table", {"restaurant": S, "party_size": {"type": "integer", "minimum": 1, "maximum": 12}, "time": {"type": "string", "format": "time"}}, ["restaurant", "party_size"]),
    _fn("file_ticket", "Open a support ticket", {"title": S, "severity": {"type": "string", "enum": ["low", "normal", "urgent"]}, "tags": {"type": "array", "items": S, "maxItems": 3}}, ["title", "severity"]),
    _fn("resize_image", "Resize an image", {"width": {"type": "integer", "minimum": 1, "maximum": 4096}, "height": {"type": "integer", "minimum": 1, "maximum": 4096}, "keep_aspect": {"type": "boolean"}}, ["width", "height"]),
    _fn("query_database", "Run a read-only query", {"table": {"type": "string", "enum": ["users", "orders", "products"]}, "limit": {"type": "integer", "minimum": 1, "maximum": 100}, "filters": {"type": "object", "properties": {"field": S, "equals": S}, "required": ["field", "equals"]}}, ["table"]),
    _fn("get_exchange_rate", "Rate between currencies", {"base": {"type": "string", "pattern": "^[A-Z]{3}$"}, "quote": {"type": "string", "pattern": "^[A-Z]{3}$"}}, ["base", "quote"]),
    _fn("noop_ping", "Check that the service is up", {}, []),
    _fn("set_volume", "Set the speaker volume", {"level": {"type": "integer", "minimum": 0, "maximum": 100}, "mute": {"type": "boolean"}}, ["level"]),
]  # fmt: skip

# A user request that fits each tool (index-aligned with TOOLS).
ASKS = [
    "What's the weather in Paris?", "Forecast for Oslo for 3 days.", "Search for llama recipes.",
    "Email bob@example.com about lunch.", "Add dentist on 2025-03-04.", "Wake me at 7:30.",
    "Convert 20 USD to EUR.", "Translate 'hello' to French.", "Price of AAPL?",
    "Book SFO to JFK on 2025-05-01.", "Remind me to buy milk.", "Play some Beatles.",
    "How do I walk from the station to the museum?", "What is 12*7?", "Look up user "
    "123e4567-e89b-12d3-a456-426614174000.", "Fetch https://example.com.",
    "Meet ann@example.com tomorrow at 10.", "Large pizza with ham.", "Set it to 21 degrees.",
    "Tech news please.", "Five stars for Alien.", "Sign up Ann, ann@example.com.",
    "I moved to 1 Main St, Springfield 12345.", "I ran for 30 minutes.", "Time in Tokyo?",
    "Table for 4 at Luigi's at 19:00.", "My printer is broken, urgent.", "Resize to 800x600.",
    "Show 5 orders.", "EUR to USD rate?", "Is the service up?", "Volume to 40.",
]  # fmt: skip
