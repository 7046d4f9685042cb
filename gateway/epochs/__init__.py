"""The salt-epoch floor: the highest `cache.salt_epoch` ever in force per tenant, persisted in the store."""
