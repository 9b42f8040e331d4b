"""OpenAI's Responses API: its schemas, output events, stored responses and routes."""
