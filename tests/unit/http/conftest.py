from tests.unit.live_redis import redis_server as redis_server
