package integration

import "go.uber.org/zap/zapcore"

type zapLevelEnabler = zapcore.LevelEnabler

var (
	debugLevel zapLevelEnabler = zapcore.DebugLevel
	errorLevel zapLevelEnabler = zapcore.ErrorLevel
)
